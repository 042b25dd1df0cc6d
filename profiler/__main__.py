from memq.cli import main

main()
