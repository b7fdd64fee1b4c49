fn main() {
    sbx_wasm::main()
}
