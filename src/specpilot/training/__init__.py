"""Trainers that improve drafters and policies from logged decoding steps."""
