"""One code generator, several renderers: ``lower`` turns a Program into loop nests;
``c_render`` prints them as C for the compiled CPU tier (the CUDA renderer prints CUDA C)."""
