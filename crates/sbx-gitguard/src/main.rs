fn main() {
    sbx_gitguard::main()
}
