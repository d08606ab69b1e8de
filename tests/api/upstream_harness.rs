//! The harness for real S3-compatible upstreams (`helpers::upstream`), checked before tests rely on its counts:
//! moto and s3s-fs each take a 3 MiB object and serve a byte range of it through the counting proxy, which counts
//! exactly those requests and their body bytes, and which makes the store unreachable and reachable again. A fake
//! upstream that answers scripted bytes checks the proxy's framing (chunked bodies both ways, keep-alive,
//! `Expect: 100-continue`, HEAD) on its own.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use crate::helpers::upstream::{CountingProxy, ProxiedRequest, S3Upstream};
use crate::helpers::*;

const MIB: u64 = 1 << 20;

/// Puts from a file object, so that botocore sends `Expect: 100-continue` and waits for the 100 before the body.
const PUT_FROM_FILE: &str = r#"
with open(spec["path"], "rb") as f:
    s3.put_object(Bucket=spec["bucket"], Key=spec["object"], Body=f)
print("null")
"#;

/// A range GET with a client that gives up at once (short timeouts, one attempt): `{"sha256", "length",
/// "content_range"}`, or `{"error"}` with the exception's class when the store cannot be reached.
const GET_RANGE: &str = r#"
quick = boto3.client("s3", endpoint_url=spec["endpoint"], aws_access_key_id=spec["key"]["id"],
    aws_secret_access_key=spec["key"]["secret"], region_name="us-east-1",
    config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, connect_timeout=2, read_timeout=2,
                  retries={"total_max_attempts": 1}))
try:
    got = quick.get_object(Bucket=spec["bucket"], Key=spec["object"], Range=spec["range"])
    body = got["Body"].read()
    print(json.dumps({"sha256": hashlib.sha256(body).hexdigest(), "length": len(body),
                      "content_range": got["ContentRange"]}))
except Exception as e:
    print(json.dumps({"error": type(e).__name__}))
"#;

#[test]
fn moto_through_counting_proxy() {
    round_trip_through_proxy(&S3Upstream::moto());
}

#[test]
fn s3s_fs_through_counting_proxy() {
    round_trip_through_proxy(&S3Upstream::s3s_fs());
}

/// Bucket, 3 MiB PUT and 1 MiB range GET through the proxy, each counted exactly; then the proxy down and up.
fn round_trip_through_proxy(store: &S3Upstream) {
    let name = store.name();
    let proxy = CountingProxy::start(store.addr());
    let bucket = store.bucket("harness");
    let object = test_bytes(3 * MIB as usize, 3);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &object).unwrap();
    let spec = serde_json::json!({"bucket": bucket, "object": "dir/three.bin", "path": file.path()});

    store.boto3(&proxy.endpoint(), PUT_FROM_FILE, spec.clone());
    let puts = proxy.requests();
    assert_eq!(puts.len(), 1, "{name}: one PUT: {puts:#?}");
    assert_eq!(
        (puts[0].method.as_str(), puts[0].target.as_str(), puts[0].status),
        ("PUT", format!("/{bucket}/dir/three.bin").as_str(), 200)
    );
    assert!(puts[0].request_body_bytes >= 3 * MIB, "{name}: {puts:#?}");
    assert_eq!((proxy.gets(), proxy.bytes_fetched()), (0, 0), "{name}");
    // Straight to the store: the proxy sees none of it.
    store.put_object(&bucket, "direct.txt", b"not proxied");
    let listed = store.list_keys(&bucket);
    assert_eq!(listed, [("dir/three.bin".to_owned(), 3 * MIB), ("direct.txt".to_owned(), 11)], "{name}");
    assert_eq!(proxy.requests().len(), 1, "{name}");

    proxy.reset();
    let range = "bytes=1048576-2097151";
    let get = serde_json::json!({"bucket": bucket, "object": "dir/three.bin", "range": range});
    let got = store.boto3(&proxy.endpoint(), GET_RANGE, get.clone());
    assert_eq!(got["sha256"], sha256_hex(&object[MIB as usize..2 * MIB as usize]), "{name}: {got}");
    assert_eq!(got["content_range"], "bytes 1048576-2097151/3145728", "{name}");
    let signed = proxy.requests()[0].authorization.clone().unwrap_or_default();
    assert!(signed.contains(&format!("Credential={}/", store.access_key())), "{name}: signed with its key: {signed}");
    assert_eq!(
        proxy.requests(),
        [ProxiedRequest {
            method: "GET".into(),
            target: format!("/{bucket}/dir/three.bin"),
            range: Some(range.into()),
            status: 206,
            response_body_bytes: MIB,
            request_body_bytes: 0,
            authorization: Some(signed.clone()),
            security_token: None,
        }],
        "{name}"
    );
    assert_eq!((proxy.gets(), proxy.bytes_fetched()), (1, MIB), "{name}");
    println!(
        "{name}: PUT of {} body bytes; GET {range}: {} bytes fetched",
        puts[0].request_body_bytes,
        proxy.bytes_fetched()
    );

    // Down: the connection is refused (botocore's EndpointConnectionError, not a connect or read timeout), and
    // nothing reached the store.
    proxy.reset();
    proxy.set_down(true);
    let failed = store.boto3(&proxy.endpoint(), GET_RANGE, get.clone());
    assert_eq!(failed["error"], "EndpointConnectionError", "{name}: refused, not timed out: {failed}");
    assert_eq!(proxy.requests(), [], "{name}");
    println!("{name}: down: {}", failed["error"]);

    // Up again, on the same port, with the same store.
    proxy.set_down(false);
    let again = store.boto3(&proxy.endpoint(), GET_RANGE, get);
    assert_eq!(again["sha256"], got["sha256"], "{name}: {again}");
    assert_eq!((proxy.gets(), proxy.bytes_fetched()), (1, MIB), "{name}");

    // The store's own view, straight from it.
    assert_eq!(store.get_object(&bucket, "dir/three.bin"), object, "{name}");
    assert_eq!(store.get_object(&bucket, "direct.txt"), b"not proxied", "{name}");
    store.delete_object(&bucket, "dir/three.bin");
    assert_eq!(store.list_keys(&bucket), [("direct.txt".to_owned(), 11)], "{name}");
}

/// One exchange of the scripted fake upstream: the request bytes the client sends (and the upstream must get,
/// unchanged), an interim response to send before the request body (for `Expect: 100-continue`), and the response.
struct Step {
    head: &'static [u8],
    interim: &'static [u8],
    body: &'static [u8],
    response: &'static [u8],
}

const STEPS: &[Step] = &[
    Step {
        head: b"GET /b/a HTTP/1.1\r\nHost: x\r\nRange: bytes=0-4\r\n\r\n",
        interim: b"",
        body: b"",
        response: b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-4/9\r\nContent-Length: 5\r\n\r\nhello",
    },
    Step {
        head: b"PUT /b/chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
        interim: b"",
        body: b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n",
        response: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    },
    Step {
        head: b"PUT /b/continued HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n",
        interim: b"HTTP/1.1 100 Continue\r\n\r\n",
        body: b"data",
        response: b"HTTP/1.1 204 No Content\r\n\r\n",
    },
    Step {
        head: b"HEAD /b/a HTTP/1.1\r\nHost: x\r\n\r\n",
        interim: b"",
        body: b"",
        response: b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
    },
    Step {
        head: b"GET /b/a?x=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        interim: b"",
        body: b"",
        response: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nhell\r\n5\r\no, up\r\n0\r\n\r\n",
    },
];

fn read_exactly(conn: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut bytes = vec![0; len];
    conn.read_exact(&mut bytes).expect("the scripted bytes");
    bytes
}

#[test]
fn proxy_frames_chunked_continue_and_keep_alive_requests() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream_addr = listener.local_addr().unwrap();
    // The fake upstream: one connection, every step on it, each request checked byte for byte.
    let fake = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        for step in STEPS {
            assert_eq!(read_exactly(&mut conn, step.head.len()), step.head);
            conn.write_all(step.interim).unwrap();
            assert_eq!(read_exactly(&mut conn, step.body.len()), step.body);
            conn.write_all(step.response).unwrap();
        }
        // Held open until the proxy shuts the connection (`set_down`).
        let mut rest = Vec::new();
        let _ = conn.read_to_end(&mut rest);
        rest
    });

    let proxy = CountingProxy::start(upstream_addr);
    let mut client = TcpStream::connect(proxy.addr()).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for step in STEPS {
        client.write_all(step.head).unwrap();
        assert_eq!(read_exactly(&mut client, step.interim.len()), step.interim);
        client.write_all(step.body).unwrap();
        assert_eq!(read_exactly(&mut client, step.response.len()), step.response);
    }

    let counted: Vec<_> = proxy
        .requests()
        .into_iter()
        .map(|r| (r.method, r.target, r.range, r.status, r.request_body_bytes, r.response_body_bytes))
        .collect();
    let expected = [
        ("GET", "/b/a", Some("bytes=0-4"), 206, 0, 5),
        ("PUT", "/b/chunked", None, 200, 11, 3),
        ("PUT", "/b/continued", None, 204, 4, 0),
        ("HEAD", "/b/a", None, 200, 0, 0),
        ("GET", "/b/a?x=1", None, 200, 0, 9),
    ]
    .map(|(m, t, r, s, up, down)| (m.to_owned(), t.to_owned(), r.map(str::to_owned), s, up, down));
    assert_eq!(counted, expected);
    assert_eq!((proxy.gets(), proxy.bytes_fetched(), proxy.connections()), (2, 14, 1));

    // Down: the open connection is shut on both sides and new ones are refused.
    proxy.set_down(true);
    let mut rest = Vec::new();
    assert!(matches!(client.read_to_end(&mut rest), Ok(0) | Err(_)), "the client's connection is closed");
    assert_eq!(fake.join().unwrap(), b"", "nothing more reached the upstream");
    let refused = TcpStream::connect_timeout(&proxy.addr(), Duration::from_secs(2));
    assert!(refused.is_err(), "a proxy that is down refuses connections");

    // Up: the same port accepts again (here the fake is gone, so the connection is closed at once).
    proxy.set_down(false);
    let mut again = TcpStream::connect(proxy.addr()).expect("the proxy accepts again");
    again.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = again.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut rest = Vec::new();
    assert!(matches!(again.read_to_end(&mut rest), Ok(0) | Err(_)), "no upstream: closed without an answer");
    assert_eq!(proxy.connections(), 2);

    // Dropped: the port is closed.
    let addr = proxy.addr();
    drop(proxy);
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_err(), "the port is closed on drop");
}
