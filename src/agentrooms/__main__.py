from agentrooms.cli import main

main()
