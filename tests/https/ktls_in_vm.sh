#!/usr/bin/env bash
# Run inside ../shared/kernel-vm/run (a kernel with TLS) by tests/api/https.rs, with OUT as its shared directory:
# serves OUT/obj.bin (and, to the user-space fallbacks, OUT/fallback.bin) with OUT/blobgate over HTTPS with kernel
# TLS under strace, one server per case, and leaves the bodies, traces, metrics and /proc/net/tls_stat in OUT for
# the test to check. Everything it runs comes from OUT or the system, so the checkout may live anywhere (the
# guest's /tmp is a fresh one of its own).
# Usage: ktls_in_vm.sh OUT CASE...   (CASE: full13 full12 range13 multi12 chacha full13-off keyupdate13 ...)
# Every wait polls for the event it waits for (a log line, a response, the client's exit), never a fixed time.
set -u
# A write to s_client after the server closed (a kernel that cannot take new receive keys) fails, not kills us.
trap '' PIPE
out=$1
shift
data=/tmp/ktls-data
# The binary from the shared directory into the guest's own memory: one sequential read over 9p instead of every
# start paging it in again.
bin=/tmp/blobgate
cp "$out/blobgate" "$bin" || exit 1

# Polls (every 0.1 s, up to 120 s: a guard against a hang, not a bound on how long a step may take) until the
# command succeeds.
until_true() {
  local _
  for _ in $(seq 1200); do "$@" && return 0; sleep 0.1; done
  echo "ktls_in_vm: gave up waiting for: $*" >&2
  return 1
}
# Whether FILE holds at least N responses.
responses_in() { [ "$(grep -c "^HTTP/1.1 206" "$1" 2>/dev/null)" -ge "$2" ]; }
# Whether FILE holds N responses or process PID has ended.
answered_or_ended() { responses_in "$1" "$2" || ! kill -0 "$3" 2>/dev/null; }

"$bin" --data-dir $data bucket create pub --public >/dev/null || exit 1
"$bin" --data-dir $data put pub obj.bin "$out/obj.bin" >/dev/null || exit 1
"$bin" --data-dir $data put pub fallback.bin "$out/fallback.bin" >/dev/null || exit 1
cat /proc/sys/net/ipv4/tcp_available_ulp > "$out/ulp"
for case in "$@"; do
  extra=()
  case $case in *-off) extra=(env BLOBGATE_TLS__KTLS=off) ;; esac
  "${extra[@]}" strace -f -yy -o "$out/strace-$case.txt" \
    -e trace=bind,accept4,read,readv,pread64,preadv,recvfrom,recvmsg,write,writev,pwrite64,sendto,sendmsg,sendfile \
    "$bin" --data-dir $data serve --listen 127.0.0.1:8443 --admin-listen 127.0.0.1:8444 \
    --tls-cert "$out/cert.pem" --tls-key "$out/key.pem" > "$out/serve-$case.log" 2>&1 &
  until_true grep -q "is serving" "$out/serve-$case.log"
  url=https://localhost:8443/pub/obj.bin
  curl=(curl -s --cacert "$out/cert.pem" -o "$out/body-$case")
  case $case in
    full13-off*) "${curl[@]}" --tlsv1.3 "${url%obj.bin}fallback.bin" ;;
    full13*) "${curl[@]}" --tlsv1.3 "$url" ;;
    full12*) "${curl[@]}" --tls-max 1.2 "$url" ;;
    range13*) "${curl[@]}" --tlsv1.3 -r 1000-4195303 "$url" ;;
    range12*) "${curl[@]}" --tls-max 1.2 -r 1000-4195303 "$url" ;;
    multi13*) "${curl[@]}" --tlsv1.3 -r 0-2097151,2500000-4597151,5000000-7097151 "$url" ;;
    multi12*) "${curl[@]}" --tls-max 1.2 -r 0-2097151,2500000-4597151,5000000-7097151 "$url" ;;
    chacha*) "${curl[@]}" --tlsv1.3 --tls13-ciphers TLS_CHACHA20_POLY1305_SHA256 "${url%obj.bin}fallback.bin" ;;
    # A request, the client's KeyUpdate (s_client's `k` command, no update asked of us), another request; the
    # test judges the outcome. s_client takes a line starting with `R` for a command: hence `range`. Each step
    # waits for the one before: the handshake, the first answer, s_client's word that it sent the KeyUpdate; then
    # for the second answer or the server's close (where the kernel cannot take new receive keys).
    keyupdate*)
      request='GET /pub/obj.bin HTTP/1.1\r\nHost: localhost\r\nrange: bytes=%s\r\n\r\n'
      body="$out/body-$case" said="$out/sclient-$case"
      rm -f /tmp/sclient-in && mkfifo /tmp/sclient-in
      openssl s_client -tls1_3 -CAfile "$out/cert.pem" -connect localhost:8443 -servername localhost \
        < /tmp/sclient-in > "$body" 2> "$said" &
      client=$!
      exec 3> /tmp/sclient-in
      until_true grep -q "Verify return code" "$body"
      printf "$request" 0-99 >&3
      until_true responses_in "$body" 1
      printf 'k\n' >&3
      until_true grep -q KEYUPDATE "$said"
      printf "$request" 100-199 >&3
      until_true answered_or_ended "$body" 2 $client
      exec 3>&-
      wait $client
      true ;;
  esac
  echo "$case $?" >> "$out/curl-status"
  curl -s --cacert "$out/cert.pem" https://localhost:8444/metrics > "$out/metrics-$case"
  pkill -TERM -f "$bin --data-dir $data serve"
  wait
done
cat /proc/net/tls_stat > "$out/tls_stat"
