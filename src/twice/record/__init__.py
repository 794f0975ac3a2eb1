"""Recording a training run as it happens: step hooks, the recorder, op logs and numerical
health."""
