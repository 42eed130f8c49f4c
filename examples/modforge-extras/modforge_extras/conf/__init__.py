"""YAML shipped by modforge-extras; on Hydra's search path as pkg://modforge_extras.conf."""
