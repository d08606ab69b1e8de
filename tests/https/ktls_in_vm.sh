#!/usr/bin/env bash
# Run inside ../shared/kernel-vm/run (a kernel with TLS) by tests/api/https.rs: serves OUT/obj.bin over HTTPS with
# kernel TLS under strace, one server per case, and leaves the bodies, traces, metrics and /proc/net/tls_stat in
# OUT for the test to check. Usage: ktls_in_vm.sh BLOBGATE OUT CASE...   (CASE: full13 full12 range13 multi12 ...)
set -u
bin=$1 out=$2
shift 2
data=/tmp/ktls-data
"$bin" --data-dir $data bucket create pub --public >/dev/null || exit 1
"$bin" --data-dir $data put pub obj.bin "$out/obj.bin" >/dev/null || exit 1
cat /proc/sys/net/ipv4/tcp_available_ulp > "$out/ulp"
for case in "$@"; do
  extra=()
  case $case in *-off) extra=(env BLOBGATE_TLS__KTLS=off) ;; esac
  "${extra[@]}" strace -f -yy -o "$out/strace-$case.txt" \
    -e trace=bind,accept4,read,readv,pread64,preadv,recvfrom,recvmsg,write,writev,pwrite64,sendto,sendmsg,sendfile \
    "$bin" --data-dir $data serve --listen 127.0.0.1:8443 --admin-listen 127.0.0.1:8444 \
    --tls-cert "$out/cert.pem" --tls-key "$out/key.pem" > "$out/serve-$case.log" 2>&1 &
  for _ in $(seq 300); do grep -q "is serving" "$out/serve-$case.log" && break; sleep 0.1; done
  url=https://localhost:8443/pub/obj.bin
  curl=(curl -s --cacert "$out/cert.pem" -o "$out/body-$case")
  case $case in
    full13*) "${curl[@]}" --tlsv1.3 "$url" ;;
    full12*) "${curl[@]}" --tls-max 1.2 "$url" ;;
    range13*) "${curl[@]}" --tlsv1.3 -r 1000-8389607 "$url" ;;
    range12*) "${curl[@]}" --tls-max 1.2 -r 1000-8389607 "$url" ;;
    multi13*) "${curl[@]}" --tlsv1.3 -r 0-4194303,5000000-9194303,10000000-14194303 "$url" ;;
    multi12*) "${curl[@]}" --tls-max 1.2 -r 0-4194303,5000000-9194303,10000000-14194303 "$url" ;;
    chacha*) "${curl[@]}" --tlsv1.3 --tls13-ciphers TLS_CHACHA20_POLY1305_SHA256 "$url" ;;
    # A request, the client's KeyUpdate (s_client's `k` command, no update asked of us), another request; the
    # test judges the outcome. s_client takes a line starting with `R` for a command: hence `range`.
    keyupdate*)
      request='GET /pub/obj.bin HTTP/1.1\r\nHost: localhost\r\nrange: bytes=%s\r\n\r\n'
      { sleep 4; printf "$request" 0-99; sleep 3; printf 'k\n'; sleep 3; printf "$request" 100-199; sleep 4; } |
        openssl s_client -tls1_3 -CAfile "$out/cert.pem" -connect localhost:8443 -servername localhost \
        > "$out/body-$case" 2> "$out/sclient-$case"
      true ;;
  esac
  echo "$case $?" >> "$out/curl-status"
  curl -s --cacert "$out/cert.pem" https://localhost:8444/metrics > "$out/metrics-$case"
  pkill -TERM -f "$bin --data-dir $data serve"
  wait
done
cat /proc/net/tls_stat > "$out/tls_stat"
