//! `spec.tls.issuerRef` on a real control plane, with a stand-in for cert-manager's Certificate
//! CRD (`e2e/testbed/cert-manager-crd.yaml`; no cert-manager runs: the test plays it by writing
//! the Secret a CA issuer would). A Database naming an issuer gets Certificate `<name>-server`
//! for its names, from that issuer, into `<name>-cert-manager-tls`; once that Secret exists its
//! pods mount it, `TLSReady` checks it, and dbop makes no CA of its own; a hand edit of the
//! Certificate is put back. (Without cert-manager: `tests/request_shapes.rs`, a 404 answer: the
//! CRD is cluster-wide and the test bed is shared.)

use dbop::api::Database;
use dbop_e2e::{WAIT, database_manifest, testbed, wait_until};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};

/// Installs the stand-in CRD (server-side apply: idempotent) and waits until it is served.
async fn install_certificate_crd(bed: &dbop_e2e::TestBed) {
    bed.install_crd_file("e2e/testbed/cert-manager-crd.yaml")
        .await;
}

fn certificates(bed: &dbop_e2e::TestBed, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate");
    Api::namespaced_with(bed.client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn spec_of(certificate: &DynamicObject) -> Value {
    certificate.data["spec"].clone()
}

/// The Secret's name the pod template mounts the server certificate from.
fn mounted(sts: &StatefulSet) -> Option<String> {
    sts.spec
        .template
        .spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find(|v| v.name == "tls")?
        .secret
        .as_ref()?
        .secret_name
        .clone()
}

#[tokio::test]
async fn an_issuers_certificate_is_requested_kept_in_shape_and_mounted() {
    let bed = testbed().await;
    install_certificate_crd(&bed).await;
    let ns = bed.namespace("certmgr").await;
    let _operator = bed.operator_in_process(&ns).await;
    let issuer = json!({"name": "corp-ca", "kind": "ClusterIssuer"});
    let db = bed
        .apply_database(
            &ns,
            database_manifest("orders", json!({"tls": {"issuerRef": issuer}})),
        )
        .await;

    // The Certificate: the Database's names, the issuer, the Secret, owned by the Database.
    let api = certificates(&bed, &ns);
    let certificate = wait_until("Certificate orders-server", WAIT, || async {
        api.get_opt("orders-server").await.ok()?
    })
    .await;
    let mut named: Database = db.clone();
    named.metadata.namespace = Some(ns.clone());
    let names = dbop::resources::tls::dns_names(&named);
    let spec = spec_of(&certificate);
    assert_eq!(spec["dnsNames"], json!(names));
    assert_eq!(
        spec["issuerRef"],
        json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
    );
    assert_eq!(spec["secretName"], "orders-cert-manager-tls");
    assert_eq!(
        spec["privateKey"],
        json!({"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"})
    );
    assert_eq!(
        (spec["duration"].clone(), spec["renewBefore"].clone()),
        (json!("2160h"), json!("720h"))
    );
    let owner = &certificate.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("Database", Some(true))
    );
    assert_eq!(Some(&owner.uid), db.metadata.uid.as_ref());

    // Until the Secret exists, TLSReady says whose it is and that the pods wait for it.
    let databases = bed.databases(&ns);
    let waiting = wait_until("TLSReady CertificateSecretInvalid", WAIT, || async {
        let db = databases.get("orders").await.ok()?;
        let c = db
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "TLSReady")?;
        (c.reason == "CertificateSecretInvalid").then_some(c.message)
    })
    .await;
    assert!(
        waiting.contains("orders-cert-manager-tls")
            && waiting.contains("Certificate orders-server"),
        "{waiting}"
    );

    // Playing cert-manager: the Secret a CA issuer writes (tls.crt, tls.key, ca.crt).
    let now = chrono::Utc::now();
    let ca = dbop::database::certificates::new_ca(&named, now).unwrap();
    let cert = dbop::database::certificates::new_server(&named, &ca, now).unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "orders-cert-manager-tls",
                     "annotations": {"cert-manager.io/certificate-name": "orders-server"}},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": cert.cert_pem, "tls.key": cert.key_pem, "ca.crt": ca.cert_pem},
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(bed.client.clone(), &ns);
    secrets
        .create(&Default::default(), &secret)
        .await
        .expect("cert-manager's Secret");
    let statefulsets: Api<StatefulSet> = Api::namespaced(bed.client.clone(), &ns);
    let sts = wait_until("the StatefulSet", WAIT, || async {
        statefulsets.get_opt("orders").await.ok()?
    })
    .await;
    assert_eq!(mounted(&sts).as_deref(), Some("orders-cert-manager-tls"));
    wait_until("TLSReady no longer waits for the Secret", WAIT, || async {
        let db = databases.get("orders").await.ok()?;
        let c = db
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "TLSReady")?;
        (c.reason != "CertificateSecretInvalid" && c.reason != "CertManagerNotInstalled")
            .then_some(())
    })
    .await;
    assert!(
        secrets.get_opt("orders-ca").await.unwrap().is_none(),
        "dbop made a CA beside the issuer's"
    );
    assert!(
        secrets
            .get_opt("orders-server-tls")
            .await
            .unwrap()
            .is_none(),
        "dbop issued a certificate beside the issuer's"
    );

    // A hand edit of the Certificate's names: put back.
    let edit = json!({"spec": {"dnsNames": ["evil.example.com"]}});
    api.patch(
        "orders-server",
        &PatchParams::default(),
        &Patch::Merge(&edit),
    )
    .await
    .expect("the hand edit");
    // The Certificate is not watched: a pass comes with the Database's next event (here, an
    // annotation), or with the periodic resync.
    let poke = json!({"metadata": {"annotations": {"e2e.dbop.dev/poke": "1"}}});
    databases
        .patch("orders", &PatchParams::default(), &Patch::Merge(&poke))
        .await
        .expect("an annotation");
    wait_until("the Certificate's names put back", WAIT, || async {
        let certificate = api.get_opt("orders-server").await.ok()??;
        (spec_of(&certificate)["dnsNames"] == json!(names)).then_some(())
    })
    .await;
}
