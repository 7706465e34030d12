# Sourced by the benchmarks that need an S3 server: `start_s3 DIR` starts
# SeaweedFS's `weed mini` (scripts/setup.sh fetches it; or $WEIR_WEED) on
# loopback, every port free, data in DIR, one bucket `weir` with the key
# pair bench/bench-secret, and returns once the bucket answers a signed
# listing. Sets WEED_PID, S3_PORT and S3_SET (the session's `s3.*` SETs).
WEED=${WEIR_WEED:-$HOME/.cache/weir-tools/bin/weed-4.48}
start_s3() {
  local dir=$1 p flag
  free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  local args=(mini -ip=127.0.0.1 -ip.bind=127.0.0.1 "-dir=$dir" -master.telemetry=false -admin.ui=false -webdav=false)
  for flag in master.port master.port.grpc volume.port volume.port.grpc filer.port filer.port.grpc \
              s3.port s3.port.grpc s3.port.iceberg s3.port.lance admin.port admin.port.grpc; do
    p=$(free_port)
    [ "$flag" = s3.port ] && S3_PORT=$p
    args+=("-$flag=$p")
  done
  mkdir -p "$dir"
  AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret S3_BUCKET=weir \
    "$WEED" "${args[@]}" > "$dir.log" 2>&1 &
  WEED_PID=$!
  for _ in $(seq 600); do
    if python3 - "$S3_PORT" <<'PY' 2>/dev/null; then break; fi
import sys, boto3
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", aws_access_key_id="bench",
                  aws_secret_access_key="bench-secret", region_name="us-east-1")
s3.list_objects_v2(Bucket="weir", MaxKeys=1)
PY
    sleep 0.1
  done
  S3_SET="SET 's3.endpoint' = 'http://127.0.0.1:$S3_PORT'; SET 's3.access-key' = 'bench';
SET 's3.secret-key' = 'bench-secret'; SET 's3.path.style.access' = 'true';"
  echo "SeaweedFS $("$WEED" version 2>/dev/null | head -1) on 127.0.0.1:$S3_PORT, data in $dir"
}
