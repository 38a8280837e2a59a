//! Version negotiation: the APIs the listener serves, with the version ranges of
//! spec/protocols.txt, and the ApiVersions answer (KIP-511 fallback included).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::messages::api_versions_response::{ApiVersion, ApiVersionsResponse};

/// Every API served, with its version range. Nothing unbuilt is listed: a client
/// reads this to decide what it may send.
///
/// DescribeConfigs v0 is outside kafka-protocol 0.18's range (1-4): its request is
/// v1's without `include_synonyms`, and its answer is written by hand
/// (`api::topics::describe_configs_v0`); every other range is the crate's to speak.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::Metadata, 1, 12),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 8),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::DescribeConfigs, 0, 4),
    (ApiKey::DescribeCluster, 0, 1),
    (ApiKey::DeleteGroups, 0, 2),
];

/// The APIs that are not built but answered with their own error if sent anyway
/// (spec/protocols.txt; `api::refuse`): transactions, SASL, ACLs, quotas and the
/// KIP-848 consumer protocol. None is in ApiVersions.
pub const REFUSED: &[ApiKey] = &[
    ApiKey::AddPartitionsToTxn,
    ApiKey::AddOffsetsToTxn,
    ApiKey::EndTxn,
    ApiKey::TxnOffsetCommit,
    ApiKey::SaslHandshake,
    ApiKey::SaslAuthenticate,
    ApiKey::DescribeAcls,
    ApiKey::CreateAcls,
    ApiKey::DeleteAcls,
    ApiKey::DescribeClientQuotas,
    ApiKey::AlterClientQuotas,
    ApiKey::ConsumerGroupHeartbeat,
];

/// The range served for `key`, if it is served.
pub fn supported(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, min, max)| (*min, *max))
}

/// Whether `version` of `key` is served.
pub fn is_supported(key: ApiKey, version: i16) -> bool {
    supported(key).is_some_and(|(min, max)| (min..=max).contains(&version))
}

/// The highest ApiVersions version served.
pub const API_VERSIONS_MAX: i16 = 3;

/// The ApiVersions answer and the version to encode it at. A request newer than we
/// serve gets UNSUPPORTED_VERSION in a v0 body that still lists our ranges (KIP-511):
/// the client retries with the highest version we listed for ApiVersions.
pub fn api_versions(request_version: i16) -> (ApiVersionsResponse, i16) {
    let keys = SUPPORTED
        .iter()
        .map(|(k, min, max)| {
            ApiVersion::default()
                .with_api_key(*k as i16)
                .with_min_version(*min)
                .with_max_version(*max)
        })
        .collect();
    let response = ApiVersionsResponse::default().with_api_keys(keys);
    if !(0..=API_VERSIONS_MAX).contains(&request_version) {
        (
            response.with_error_code(ResponseError::UnsupportedVersion.code()),
            0,
        )
    } else {
        (response, request_version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::protocol::{Decodable, Encodable, Message};

    #[test]
    fn every_advertised_range_is_one_the_protocol_crate_can_speak() {
        for (key, min, max) in SUPPORTED {
            let crate_range = key.valid_versions();
            // v0, by hand (see SUPPORTED).
            let min = if *key == ApiKey::DescribeConfigs {
                &1
            } else {
                min
            };
            assert!(
                crate_range.min <= *min && *max <= crate_range.max,
                "{key:?} {min}-{max} is outside kafka-protocol's {crate_range}"
            );
        }
    }

    #[test]
    fn a_too_new_api_versions_request_gets_our_ranges_in_a_v0_body() {
        let (response, version) = api_versions(4);
        assert_eq!(version, 0);
        assert_eq!(
            response.error_code,
            ResponseError::UnsupportedVersion.code()
        );
        let mut buf = BytesMut::new();
        response.encode(&mut buf, version).unwrap();
        let decoded = ApiVersionsResponse::decode(&mut buf.freeze(), 0).unwrap();
        let av = decoded
            .api_keys
            .iter()
            .find(|k| k.api_key == ApiKey::ApiVersions as i16)
            .unwrap();
        assert_eq!((av.min_version, av.max_version), (0, 3));
        assert_eq!(decoded.api_keys.len(), SUPPORTED.len());
    }

    #[test]
    fn each_served_api_versions_version_is_answered_at_itself() {
        for v in 0..=API_VERSIONS_MAX {
            let (response, version) = api_versions(v);
            assert_eq!(version, v);
            assert_eq!(response.error_code, 0);
            let mut buf = BytesMut::new();
            response.encode(&mut buf, version).unwrap();
        }
        const { assert!(ApiVersionsResponse::VERSIONS.max >= API_VERSIONS_MAX) };
    }

    #[test]
    fn unbuilt_apis_are_not_advertised() {
        for key in [
            ApiKey::EndTxn,
            ApiKey::AddPartitionsToTxn,
            ApiKey::SaslHandshake,
            ApiKey::CreateAcls,
            ApiKey::DescribeClientQuotas,
            ApiKey::ConsumerGroupHeartbeat,
        ] {
            assert!(supported(key).is_none(), "{key:?}");
        }
        assert!(is_supported(ApiKey::Produce, 3));
        assert!(!is_supported(ApiKey::Produce, 2));
        assert!(!is_supported(ApiKey::Fetch, 13));
    }
}
