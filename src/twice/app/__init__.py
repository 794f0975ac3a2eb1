"""What the commands do: launch, verify, compare, locate, sweep and report, one module each."""
