//! `drainshim inject` and `drainshim webhook` on input nobody checked: the
//! first byte picks manifests (YAML, injected then uninjected) or an
//! AdmissionReview body, the mode (Istio or not) and the path (which
//! namespace called); the rest is the input.
#![no_main]

use drainshim::inject::manifest::{transform, Direction};
use drainshim::inject::mesh::Namespace;
use drainshim::inject::webhook::Webhook;
use drainshim::inject::{InjectOptions, Mode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    // Even: manifests (with --services when the second bit is set, in the
    // Istio mode when the third is).
    let istio = which & 4 != 0;
    let settings = InjectOptions {
        services: which & 2 != 0 && !istio,
        mode: if istio { Mode::Istio } else { Mode::Sidecar },
        ..InjectOptions::default()
    };
    if which % 2 == 0 {
        let Ok(text) = std::str::from_utf8(body) else {
            return;
        };
        if let Ok((once, _)) = transform(text, &settings, Direction::Inject) {
            // Injecting twice is injecting once, and undoing it is accepted.
            let (twice, _) =
                transform(&once, &settings, Direction::Inject).expect("its own output injects");
            assert_eq!(once, twice);
            transform(&once, &settings, Direction::Uninject).expect("its own output uninjects");
        }
    } else {
        // Every answer allows the pod.
        let hook = Webhook::new(settings, "default".into());
        let ns = match (which >> 3) % 3 {
            0 => Namespace::Unlabelled,
            1 => Namespace::Injected,
            _ => Namespace::Disabled,
        };
        let (answer, _) = hook.review(body, ns);
        assert!(answer.is_null() || answer["response"]["allowed"] == true);
    }
});
