"""The unit and environment templates, installed as the package provision.templates (pyproject.toml
maps this folder there). This file makes it a regular package: an editable install cannot import a
mapped folder without one (setuptools issue 4943)."""
