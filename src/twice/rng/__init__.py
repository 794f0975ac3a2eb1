"""Every random number generator a training run draws from: seeding, snapshots, fingerprints,
streams."""
