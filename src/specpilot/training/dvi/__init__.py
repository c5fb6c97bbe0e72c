"""DVI's offline trainer (`specpilot train-dvi`); the online learner it drives lives with the
drafter, in drafting.dvi_learning."""
