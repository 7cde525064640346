"""A plan as something to look at: its graph and statistics, the renderers (text, Mermaid, DOT, HTML),
the X-ray of where an iteration's time goes, run views, traces and the doctor's verdict."""
