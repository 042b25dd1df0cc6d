"""Rendering of analysis results to a stream the caller gives (terminal, JSON)."""
