# Prints a set of strings: its order depends on the hash seed.
print(list({"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"}))
