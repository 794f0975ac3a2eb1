"""The arithmetic every portable kernel is built from: exact sums and products rounded once, twice's
own elementwise algorithms and their coefficients, and Philox random numbers."""
