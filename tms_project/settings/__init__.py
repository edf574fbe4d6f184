"""Settings package: ``base`` reads everything from the environment, ``test`` adjusts for pytest."""
