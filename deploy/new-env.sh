#!/bin/sh
# Prints a new .env for compose.yaml: the secrets and keys every service of the fleet shares,
# each one random. Usage: deploy/new-env.sh > deploy/.env
set -eu
random() { head -c "$1" /dev/urandom | base64 | tr -d '\n/+='; }
cat <<ENV
# Clients send one of these as 'Authorization: Bearer KEY' (comma-separated; or mount a keys file
# and set VIDSERVE_KEYS_FILE).
VIDSERVE_API_KEYS=vs-$(random 32)
# Every API and worker signs webhooks with this one secret, and stream URLs with the next.
VIDSERVE_WEBHOOK_SECRET=whsec_$(head -c 32 /dev/urandom | base64 | tr -d '\n')
VIDSERVE_STREAM_SECRET=$(random 32)
# The S3 store's one identity: SeaweedFS makes it its admin, and vidserve signs with it.
AWS_ACCESS_KEY_ID=vidserve-$(random 9)
AWS_SECRET_ACCESS_KEY=$(random 30)
AWS_DEFAULT_REGION=us-east-1
ENV
