// Compiles the precompiled header; intentionally empty.
