from hllm.cli import main

main()
