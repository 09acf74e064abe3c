"""Adapters that let other frameworks train and evaluate against simpop envs and simulators."""
