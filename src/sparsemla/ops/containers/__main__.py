from sparsemla.ops.containers.cli import main

main()
