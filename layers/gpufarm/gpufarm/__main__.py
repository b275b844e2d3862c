"""`python -m gpufarm` runs the command line."""

from gpufarm.cli import main

if __name__ == "__main__":
    main()
