from .lifecycle import main

main()
