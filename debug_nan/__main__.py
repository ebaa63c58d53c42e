from debug_nan.cli import main

main()
