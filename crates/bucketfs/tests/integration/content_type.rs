//! Files written through a mount are stored with the Content-Type their name calls for
//! (as s3fs, rclone and geesefs do), so a web server or CDN in front of the bucket serves
//! them right; a rename carries a guessed type along, a type set by another tool stays.

use crate::common::*;

fn content_type(bucket: &str, key: &str) -> Option<String> {
    let head = block_on(s3().head_object().bucket(bucket).key(key).send()).expect("head");
    head.content_type().map(str::to_owned)
}

/// What the store answers for an object stored without a type.
fn store_default(bucket: &str) -> Option<String> {
    block_on(s3().put_object().bucket(bucket).key("untyped").body(b"x".to_vec().into()).send()).expect("put");
    let default = content_type(bucket, "untyped");
    delete(bucket, "untyped");
    default
}

#[test]
fn new_files_are_stored_with_the_type_of_their_extension() {
    let b = create_bucket("content-type");
    let untyped = store_default(&b);
    for write_back in [false, true] {
        let mut builder = MountBuilder::new().bucket(&b).args(["--metadata-ttl", "0"]);
        if write_back {
            builder = builder.arg("--write-back");
        }
        let m = builder.mount();
        let dir = if write_back { "wb" } else { "plain" };
        std::fs::create_dir(m.join(dir)).expect("mkdir");
        for name in ["page.html", "photo.jpg", "notes.txt", "data.json", "blob.unknownext", "Makefile"] {
            std::fs::write(m.join(format!("{dir}/{name}")), b"content").expect("write");
        }
        // O_RDWR goes through a staging file: the same type.
        let staged =
            std::fs::File::options().read(true).write(true).create_new(true).open(m.join(format!("{dir}/s.css")));
        drop(staged.expect("create O_RDWR"));
        drop(m); // unmounts once every upload is stored
        let expected = [
            ("page.html", Some("text/html")),
            ("photo.jpg", Some("image/jpeg")),
            ("notes.txt", Some("text/plain")),
            ("data.json", Some("application/json")),
            ("s.css", Some("text/css")),
            ("blob.unknownext", untyped.as_deref()),
            ("Makefile", untyped.as_deref()),
        ];
        for (name, expected) in expected {
            assert_eq!(content_type(&b, &format!("{dir}/{name}")).as_deref(), expected, "{dir}/{name}");
        }
    }
}

#[test]
fn a_rename_carries_a_guessed_type_and_keeps_a_chosen_one() {
    let b = create_bucket("content-type-rename");
    let untyped = store_default(&b);
    let chosen = block_on(
        s3().put_object()
            .bucket(&b)
            .key("custom.txt")
            .content_type("application/x-custom")
            .body(b"c".to_vec().into())
            .send(),
    );
    chosen.expect("put with a type");
    let m = MountBuilder::new().bucket(&b).args(["--metadata-ttl", "0"]).mount();
    std::fs::write(m.join("report.tmp"), b"<p>report</p>").expect("write");
    std::fs::rename(m.join("report.tmp"), m.join("report.html")).expect("mv .tmp .html");
    std::fs::rename(m.join("custom.txt"), m.join("custom.html")).expect("mv of a file typed elsewhere");
    std::fs::write(m.join("t.txt"), b"t").expect("write");
    std::fs::rename(m.join("t.txt"), m.join("t")).expect("mv to no extension");
    assert_eq!(content_type(&b, "report.html").as_deref(), Some("text/html"));
    assert_eq!(content_type(&b, "custom.html").as_deref(), Some("application/x-custom"));
    // No type stored: the store's default (MinIO says application/ after a PUT and
    // binary/ after a copy).
    let renamed = content_type(&b, "t");
    assert!(renamed == untyped || renamed.as_deref() == Some("binary/octet-stream"), "{renamed:?}");
}

/// With `--no-content-type-from-name` a file is stored as a client that sends no type
/// stores it: compared with such a PUT of the same name (SeaweedFS gives an object PUT
/// without a type, or with `application/octet-stream`, its name's guessed type itself,
/// so a name without an extension would not tell).
#[test]
fn the_guess_can_be_turned_off() {
    let b = create_bucket("content-type-off");
    block_on(s3().put_object().bucket(&b).key("untyped/page.html").body(b"x".to_vec().into()).send()).expect("put");
    let untyped = content_type(&b, "untyped/page.html");
    let m = MountBuilder::new().bucket(&b).args(["--no-content-type-from-name"]).mount();
    std::fs::write(m.join("page.html"), b"<p>x</p>").expect("write");
    assert_eq!(content_type(&b, "page.html"), untyped);
}
