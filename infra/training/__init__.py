"""Training jobs: the environment the platform gives them, memory sizing and which pools a run fits."""
