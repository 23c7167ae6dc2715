"""Neural distances (RDMs): distance measures, sources, cross-validated distances,
searchlights over space and time."""
