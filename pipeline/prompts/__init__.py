"""Prompt sets: the shipped YAML sets and Spec-Bench files (data in this folder), a user's JSONL, chat templates, and
two-turn questions whose first answer is generated once and stored. May import pipeline.config, pipeline.tracking,
speclab and store.
"""
