"""The resolved platform: a stack spec joined with the data (versions, package sets, zones, storage,
boot times, the model-server layout). Everything downstream reads a ResolvedPlatform."""
