"""The portable kernels, one module per op family, each registering its overloads in the table."""
