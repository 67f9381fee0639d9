//! Where prepare reads a claim: the API server in the agent, a map in the benches and tests.

use super::PrepareError;
use crate::kubelet_plugin::ClaimRef;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;

/// Reads the ResourceClaim the kubelet names (by namespace and name; the caller checks the uid).
#[async_trait::async_trait]
pub trait ClaimSource: Send + Sync + 'static {
    async fn claim(&self, claim: &ClaimRef) -> Result<ResourceClaim, PrepareError>;
}

/// The API server, or nothing when the agent has no kube link.
pub struct ApiClaims(pub Option<kube::Client>);

#[async_trait::async_trait]
impl ClaimSource for ApiClaims {
    async fn claim(&self, claim: &ClaimRef) -> Result<ResourceClaim, PrepareError> {
        let client = self.0.clone().ok_or(PrepareError::NoApiServer)?;
        let api: Api<ResourceClaim> = Api::namespaced(client, &claim.namespace);
        api.get(&claim.name).await.map_err(PrepareError::Api)
    }
}
