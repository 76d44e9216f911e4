"""Helpers the test modules share: import them from here, never from another test module."""
