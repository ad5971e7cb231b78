"""Tests of kvlog.log: producer rules, basics, faults, concurrency, corruption, bad input."""
