"""The fleet edge's pure rules: the trust root's certificate rules (`pki`), the routes an edge
carries (`routes`) and the haproxy configuration rendered from them (`haproxy`)."""
