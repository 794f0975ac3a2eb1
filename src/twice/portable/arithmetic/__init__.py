"""The arithmetic every portable kernel is built from: exact sums and products rounded once, float64
products in one order, twice's own elementwise algorithms and their coefficients, and Philox."""
