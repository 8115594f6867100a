"""Embedded text tasks: problem generators, prompt formats and verifiable rewards."""
