"""The relay service: promotes committed half messages to their real topics."""
