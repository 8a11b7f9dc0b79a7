from dprun.launcher import main

main()
