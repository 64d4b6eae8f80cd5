"""Model components: build the seeded tiny SD 1.x model, load a local diffusers folder."""
