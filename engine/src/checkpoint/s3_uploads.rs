//! S3's ListMultipartUploads, which `object_store` does not offer: the
//! uploads started below a prefix and neither completed nor aborted.
//!
//! The exactly-once file sink needs it to find the uploads a crash left
//! behind. A marker object written after an upload is created names most
//! of them, but a writer killed between the creation and the marker
//! leaves an upload only this listing shows; without it such uploads
//! would hold storage (billed, invisible) until a lifecycle rule removes
//! them. The request is signed with `object_store`'s own SigV4
//! authorizer and the store's credentials, and sent with its HTTP client,
//! so it reaches the store exactly as the store's other requests do.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, AwsAuthorizer};
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};

/// One upload in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    /// The object key it will complete to.
    pub key: String,
    pub id: String,
}

/// Lists a bucket's multipart uploads.
pub struct S3Uploads {
    s3: Arc<AmazonS3>,
    /// The bucket's URL (`https://s3.<region>.amazonaws.com/<bucket>`, or
    /// below the configured endpoint), as the store computes it.
    bucket_endpoint: String,
    region: String,
    client: HttpClient,
}

impl std::fmt::Debug for S3Uploads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3Uploads({})", self.bucket_endpoint)
    }
}

/// Requests retried on a throttling or server error (503 SlowDown, 500).
const ATTEMPTS: u32 = 8;

impl S3Uploads {
    /// The lister of `bucket`, which `builder` built `s3` for (the
    /// builder knows its bucket from the URL only once it built).
    pub fn new(builder: &AmazonS3Builder, bucket: &str, s3: Arc<AmazonS3>) -> Result<Self, String> {
        let get = |k: AmazonS3ConfigKey| builder.get_config_value(&k).filter(|v| !v.is_empty());
        let region = get(AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".into());
        let virtual_hosted = get(AmazonS3ConfigKey::VirtualHostedStyleRequest).is_some_and(|v| v == "true");
        // As `AmazonS3Builder::build` does (an endpoint given for
        // virtual-hosted requests already names the bucket).
        let endpoint = get(AmazonS3ConfigKey::Endpoint);
        let bucket_endpoint = match (&endpoint, virtual_hosted) {
            (Some(e), true) => e.trim_end_matches('/').to_string(),
            (Some(e), false) => format!("{}/{bucket}", e.trim_end_matches('/')),
            (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
            (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
        };
        let allow_http = bucket_endpoint.to_ascii_lowercase().starts_with("http://");
        let client = ReqwestConnector::default()
            .connect(&object_store::ClientOptions::new().with_allow_http(allow_http))
            .map_err(|e| format!("cannot make an HTTP client for {bucket_endpoint}: {e}"))?;
        Ok(Self {
            s3,
            bucket_endpoint,
            region,
            client,
        })
    }

    /// The uploads whose keys start with `prefix`, every page of them.
    pub async fn list(&self, prefix: &str) -> Result<Vec<Upload>, String> {
        let mut out = vec![];
        let mut markers: Option<(String, String)> = None;
        loop {
            let mut query = format!("uploads=&prefix={}", encode(prefix));
            if let Some((key, id)) = &markers {
                query.push_str(&format!("&key-marker={}&upload-id-marker={}", encode(key), encode(id)));
            }
            let page = parse(&self.get(&query).await?)?;
            let last = page.uploads.last().map(|u| (u.key.clone(), u.id.clone()));
            out.extend(page.uploads);
            if !page.truncated {
                return Ok(out);
            }
            // S3 names the next page's markers; some servers (SeaweedFS)
            // only the upload's: the last listed continues the listing.
            let next = match (page.next_key, page.next_id, last) {
                (Some(k), Some(i), _) => (k, i),
                (None, Some(i), Some((k, _))) => (k, i),
                (_, _, Some(last)) => last,
                (_, _, None) => return Err("a truncated page of uploads listed none".into()),
            };
            if markers.as_ref() == Some(&next) {
                return Err(format!("the listing of uploads does not advance past {next:?}"));
            }
            markers = Some(next);
        }
    }

    /// The body of a signed GET of the bucket with `query`, retried with
    /// backoff while the store throttles or fails.
    async fn get(&self, query: &str) -> Result<bytes::Bytes, String> {
        let uri = format!("{}?{query}", self.bucket_endpoint);
        let mut wait = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let credential = self
                .s3
                .credentials()
                .get_credential()
                .await
                .map_err(|e| format!("no S3 credentials: {e}"))?;
            let mut request = http::Request::builder()
                .method(http::Method::GET)
                .uri(&uri)
                .body(HttpRequestBody::empty())
                .map_err(|e| format!("{uri}: {e}"))?;
            AwsAuthorizer::new(&credential, "s3", &self.region).authorize(&mut request, None);
            let retry = match self.client.execute(request).await {
                Ok(response) => {
                    let status = response.status();
                    let body = response
                        .into_body()
                        .bytes()
                        .await
                        .map_err(|e| format!("listing the uploads of {}: {e}", self.bucket_endpoint));
                    if status.is_success() {
                        return body;
                    }
                    let text = body
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                        .unwrap_or_default();
                    let message = format!("listing the uploads of {}: {status}: {text}", self.bucket_endpoint);
                    if !(status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS) {
                        return Err(message);
                    }
                    message
                }
                Err(e) => format!("listing the uploads of {}: {e}", self.bucket_endpoint),
            };
            if attempt >= ATTEMPTS {
                return Err(retry);
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }
}

/// One page of ListMultipartUploads.
#[derive(Debug, Default, PartialEq)]
struct Page {
    uploads: Vec<Upload>,
    truncated: bool,
    next_key: Option<String>,
    next_id: Option<String>,
}

fn parse(body: &[u8]) -> Result<Page, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Result {
        #[serde(default)]
        is_truncated: bool,
        next_key_marker: Option<String>,
        next_upload_id_marker: Option<String>,
        #[serde(default, rename = "Upload")]
        uploads: Vec<UploadXml>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct UploadXml {
        key: String,
        upload_id: String,
    }
    let r: Result = quick_xml::de::from_reader(body).map_err(|e| {
        format!(
            "not a ListMultipartUploads answer ({e}): {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )
    })?;
    Ok(Page {
        uploads: r
            .uploads
            .into_iter()
            .map(|u| Upload {
                key: u.key,
                id: u.upload_id,
            })
            .collect(),
        truncated: r.is_truncated,
        next_key: r.next_key_marker.filter(|k| !k.is_empty()),
        next_id: r.next_upload_id_marker.filter(|k| !k.is_empty()),
    })
}

/// `s` percent-encoded as a query value (RFC 3986 unreserved characters
/// kept), as SigV4 canonicalizes it.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_of_uploads_is_read_as_s3_and_seaweedfs_write_it() {
        // SeaweedFS 4.48's answer (no NextKeyMarker).
        let body = br#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>weir</Bucket><Delimiter></Delimiter><EncodingType></EncodingType><IsTruncated>true</IsTruncated><KeyMarker></KeyMarker><MaxUploads>1</MaxUploads><NextUploadIdMarker>0b1c_2fd2</NextUploadIdMarker><Prefix>pre/</Prefix><Upload><Initiated>2026-12-06T16:55:16Z</Initiated><Key>pre/x/part-a&amp;b.json</Key><UploadId>0b1c_2fd2</UploadId></Upload></ListMultipartUploadsResult>"#;
        assert_eq!(
            parse(body).expect("parse"),
            Page {
                uploads: vec![Upload {
                    key: "pre/x/part-a&b.json".into(),
                    id: "0b1c_2fd2".into()
                }],
                truncated: true,
                next_key: None,
                next_id: Some("0b1c_2fd2".into()),
            }
        );
        // AWS's, the last page, two uploads.
        let body = br#"<ListMultipartUploadsResult><Bucket>b</Bucket><NextKeyMarker>k2</NextKeyMarker><NextUploadIdMarker>i2</NextUploadIdMarker><IsTruncated>false</IsTruncated><Upload><Key>k1</Key><UploadId>i1</UploadId><Initiator><ID>x</ID></Initiator></Upload><Upload><Key>k2</Key><UploadId>i2</UploadId></Upload></ListMultipartUploadsResult>"#;
        let page = parse(body).expect("parse");
        assert_eq!(page.uploads.len(), 2);
        assert!(!page.truncated);
        assert_eq!(page.next_key.as_deref(), Some("k2"));
        // None listed.
        let page = parse(b"<ListMultipartUploadsResult><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>")
            .expect("parse");
        assert_eq!(page, Page::default());
        assert!(parse(b"not xml <").is_err());
    }

    #[test]
    fn query_values_are_encoded_as_sigv4_canonicalizes_them() {
        assert_eq!(
            encode("jobs/q5 out/part-a=1~.json"),
            "jobs%2Fq5%20out%2Fpart-a%3D1~.json"
        );
    }
}
