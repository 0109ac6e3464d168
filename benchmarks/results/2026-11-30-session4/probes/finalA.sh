export PYTHONUNBUFFERED=1
STRICTOPS_GPU_PARTS="tests bench" bash .ci/gpu -m gpu 2>&1 | grep -E "^===|passed|failed|FAILED|Error|TFLOPS|bars" | tail -40
