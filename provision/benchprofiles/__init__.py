"""Published benchmark profiles shipped with the tool, each as its source publishes it (its repository,
path and commit in the comment above it): `invoke bench --profile NAME` finds them by file name."""
