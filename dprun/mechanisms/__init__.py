"""Noise mechanisms and the random sampling they rely on."""
