"""The instructor's tools: generate stubs and fixtures, check the kit, grade submissions."""
