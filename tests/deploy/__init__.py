"""Tests of the container and Kubernetes manifests (Dockerfile, deploy/)."""
