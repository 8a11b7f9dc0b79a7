from dprun.cli import main

main()
