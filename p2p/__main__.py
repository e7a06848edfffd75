from p2p.cli import main

main()
