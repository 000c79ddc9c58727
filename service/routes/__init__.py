"""One router per resource: compile, jobs, artifacts, health."""
