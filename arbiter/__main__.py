from arbiter.cli.main import main

main()
