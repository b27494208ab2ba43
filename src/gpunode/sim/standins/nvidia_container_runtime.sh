#!/bin/sh
# Stand-in for nvidia-container-runtime @TOOLKIT_VERSION@ in a simulated node: an OCI runtime
# that hands every call to runc, as the real one does once it has added its prestart hook.
exec runc "$@"
