"""`python -m twice`: the same command line as the `twice` script."""

from twice.cli import main

if __name__ == "__main__":
    main()
