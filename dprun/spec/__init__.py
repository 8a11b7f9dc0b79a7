"""The spec: its model (`models`), its loading and checks (`validation`: spec → validated spec),
and what they read.

Nothing is imported here: a module that needs only the spec's types (the plan, which the card
helper unpickles) does not load the checks, the SQL parser and the schema readers with them.
"""
