"""The verification suites, one per provisioning step (run with -p gpunode.verify.plugin)."""
